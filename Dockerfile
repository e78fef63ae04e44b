# One image for every Boomerang service; the command picks the service
# (`boomerang registry`, `boomerang router`, ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY requirements.lock ./
RUN pip install --no-cache-dir -r requirements.lock

COPY pyproject.toml README.md ./
COPY proto ./proto
COPY libs ./libs
COPY services ./services
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
    && useradd --system --uid 10001 boomerang
USER boomerang

ENTRYPOINT ["boomerang"]
CMD ["--help"]
