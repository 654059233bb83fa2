exec '/root/.cache/tgi-peers/llama.cpp-native-496b83d1/bin/llama-server' -m '/root/.cache/tgi-peers/models/model-q4_1.gguf' -c 32768 -np 16 -cb --port 8200 -t 2 --host 127.0.0.1 --spec-type ngram-mod
