"""Building blocks shared by the model families: norms, linears, rotary embeddings, activations."""
