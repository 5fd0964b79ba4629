# The evaluator's image: the agent image (metrics libraries, Java for METEOR) plus this
# package's evaluators (pure Python, on PYTHONPATH).
ARG AGENT
FROM ${AGENT}
COPY automedbench /opt/automedbench
ENV PYTHONPATH=/opt/automedbench HOME=/tmp
WORKDIR /tmp
