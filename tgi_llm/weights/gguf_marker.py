"""The file written last into a converted GGUF directory: its presence means the conversion finished.

Its own module because the resolver (no torch) and both converters (torch) read it."""

MARKER_FILE = "tgi_llm_gguf_source.json"
