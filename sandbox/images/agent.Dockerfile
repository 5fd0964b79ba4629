# The agent's image: a Debian userland with compilers and the scientific Python stack,
# installed from a wheelhouse the host prepared (no network needed here) into the system
# Python; /venv sees it (system site packages), and so does a venv an agent makes.
ARG BASE
FROM ${BASE}
ARG PACKAGES
# A debootstrap-made base already has the packages; a registry base gets them from apt.
RUN dpkg -s ${PACKAGES} >/dev/null 2>&1 || ( apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${PACKAGES} \
    && rm -rf /var/lib/apt/lists/* )
COPY wheels /tmp/wheels
RUN python3 -m pip install --no-cache-dir --no-index --break-system-packages \
       --disable-pip-version-check --find-links /tmp/wheels -r /tmp/wheels/requirements.txt \
    && python3 -m venv --system-site-packages --without-pip /venv \
    && rm -rf /tmp/wheels
ENV PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/venv LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
WORKDIR /workspace
