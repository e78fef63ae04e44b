# One image for every Boomerang service; the command picks the service
# (`boomerang registry`, `boomerang router`, ...).
#
# Runtime dependencies only (requirements.lock; the tools' and the development and
# test pins stay out), and Boomerang installed from a wheel, not editable. The
# wheel is the runtime package alone: the tools (tools/, boomerang-tools: the demo,
# the simulator, `boomerang up`, matplotlib) are a distribution of their own, outside
# the build context (.dockerignore). tests/unit/test_image_contents.py checks both.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY client ./client
COPY libs ./libs
COPY services ./services
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./client .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.lock /tmp/requirements.lock
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir -r /tmp/requirements.lock \
    && pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/requirements.lock \
    && useradd --system --uid 10001 boomerang \
    && install -d -o boomerang -g boomerang -m 0700 /credentials
# /credentials: where docker-compose.yml's migrate service writes each component's token
# (a named volume there starts out owned by the boomerang user).
USER boomerang
WORKDIR /home/boomerang

ENTRYPOINT ["boomerang"]
CMD ["--help"]
