#!/usr/bin/env bash
# A real Open WebUI against the memory service's chat proxy: installs Open WebUI 0.12.4 in
# its own virtualenv (about 3 GB and 3 minutes; the CPU torch wheel first, so pip never
# pulls CUDA packages), starts a scripted model (or uses LLM_BASE_URL/LLM_MODEL), the
# memory service and Open WebUI offline, then signs up, lists models, chats and shows the
# memory formed. Heavy: not part of `make test`. Run from anywhere:
#
#   scripts/openwebui/run.sh            # OWUI_VENV=... reuses an installed Open WebUI
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
WORK=${OWUI_WORK:-$ROOT/.openwebui}
VENV=${OWUI_VENV:-$WORK/venv}
SERVICE_PORT=${SERVICE_PORT:-8770}
LLM_PORT=${DEMO_LLM_PORT:-8771}
OWUI_PORT=${OWUI_PORT:-8780}
PY=$(command -v python3.11 || command -v python3)
mkdir -p "$WORK"
test -x .venv/bin/python || make install

if [ ! -x "$VENV/bin/open-webui" ]; then
  echo "== installing Open WebUI into $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -U pip
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
  "$VENV/bin/pip" install -q --disable-pip-version-check open-webui==0.12.4
fi

# The demo's memory service keeps its data apart: its own embedded PostgreSQL in
# $DEMO_DATA, started fresh, never the .data directory or the DATABASE_URL of your own
# service (the demo migrates, creates a user and a key, and writes memories).
DEMO_DATA=${OWUI_MEMORY_DATA:-$WORK/memory-data}
unset DATABASE_URL
export MEMORY_DATA_DIR="$DEMO_DATA" EMBEDDED_DB_NAME=memory EMBEDDED_DB_SHARED_BUFFERS=128MB
stop_demo_db() {
  .venv/bin/python -c "import sys; from core.embedded_pg import stop_embedded_postgres; \
stop_embedded_postgres(sys.argv[1])" "$DEMO_DATA" 2>/dev/null || true
}
stop_demo_db  # left running by an interrupted run
rm -rf "$DEMO_DATA"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true
  stop_demo_db
}
trap cleanup EXIT

wait_for() {  # url, seconds
  for _ in $(seq "$2"); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 1; done
  echo "timed out waiting for $1" >&2; return 1
}

if [ -z "${LLM_BASE_URL:-}" ]; then
  "$PY" scripts/openwebui/demo_llm.py "$LLM_PORT" & pids+=($!)
  export LLM_BASE_URL="http://127.0.0.1:$LLM_PORT/v1" LLM_MODEL=demo-model
  wait_for "$LLM_BASE_URL/models" 30
fi

# The memory service (web + worker, on $DEMO_DATA); memories form as soon as a message arrives.
export MEMORY_UPDATE_DEBOUNCE_SECONDS=0
.venv/bin/python manage.py migrate -v 0
KEY=$(.venv/bin/python manage.py create_api_key owui-demo --create-user --name "open-webui demo" | tail -n 1)
.venv/bin/python manage.py serve --port "$SERVICE_PORT" > "$WORK/service.log" 2>&1 & pids+=($!)
wait_for "http://127.0.0.1:$SERVICE_PORT/healthz" 120

# Open WebUI, offline, talking to the proxy with the memory API key, forwarding its user
# and chat ids as X-OpenWebUI-* headers.
rm -rf "$WORK/data"
(
  export DATA_DIR="$WORK/data" WEBUI_SECRET_KEY=demo-secret
  export OFFLINE_MODE=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  export RAG_EMBEDDING_MODEL_AUTO_UPDATE=false RAG_RERANKING_MODEL_AUTO_UPDATE=false
  export WHISPER_MODEL_AUTO_UPDATE=false ENABLE_VERSION_UPDATE_CHECK=false
  export BYPASS_EMBEDDING_AND_RETRIEVAL=true ENABLE_OLLAMA_API=false
  export ANONYMIZED_TELEMETRY=false DO_NOT_TRACK=true SCARF_NO_ANALYTICS=true
  export ENABLE_OPENAI_API=true OPENAI_API_BASE_URL="http://127.0.0.1:$SERVICE_PORT/v1"
  export OPENAI_API_KEY="$KEY" ENABLE_FORWARD_USER_INFO_HEADERS=true
  exec "$VENV/bin/open-webui" serve --host 127.0.0.1 --port "$OWUI_PORT"
) > "$WORK/openwebui.log" 2>&1 & pids+=($!)
wait_for "http://127.0.0.1:$OWUI_PORT/health" 180

"$PY" scripts/openwebui/demo.py "http://127.0.0.1:$OWUI_PORT" "http://127.0.0.1:$SERVICE_PORT" "$KEY"
