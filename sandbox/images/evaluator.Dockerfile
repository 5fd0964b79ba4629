# The evaluator's image: the agent image (metrics libraries, Java for METEOR) plus this
# package's evaluators (pure Python, on PYTHONPATH).
ARG AGENT
FROM ${AGENT}
COPY automedbench /opt/automedbench
# Their bytecode, compiled once here: an evaluator's root is read-only, so without it
# every evaluator start (cold or warm) would compile the package again.
RUN python -m compileall -q /opt/automedbench
# No pydantic plugin (none is installed; looking for one scans every package's metadata
# at each start).
ENV PYTHONPATH=/opt/automedbench HOME=/tmp PYDANTIC_DISABLE_PLUGINS=__all__
WORKDIR /tmp
