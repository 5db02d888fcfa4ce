"""Services the page (``ui``) and the API (``app``) share, below both: they use the engine and the
store, and know nothing of Gradio or HTTP."""
