# The evaluator's image: the agent image plus the report metrics (pycocoevalcap, run
# with the base's Java) and the evaluator package itself (pure Python, on PYTHONPATH).
ARG AGENT
FROM ${AGENT}
COPY wheels /tmp/wheels
RUN /venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels \
       -r /tmp/wheels/requirements.txt \
    && rm -rf /tmp/wheels
COPY automedbench /opt/automedbench
ENV PYTHONPATH=/opt/automedbench HOME=/tmp
WORKDIR /tmp
