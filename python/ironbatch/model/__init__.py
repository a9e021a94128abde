"""The model side of the engine: Hugging Face config and weight loading, the
Llama-family model, the KV-cache tensors, the model runner and the sampler.
Importing it needs torch (``pip install 'ironbatch[engine]'``)."""
