"""The reply service the page (``ui``) and the API (``app``) share, below both: it holds the
engine host, the store and the registry of running replies, and knows nothing of Gradio or HTTP."""
