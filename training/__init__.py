"""Training for the embedded tiny coder: tokenizer, target LM and DFlash draft
(self-distillation). Torch + transformers + tokenizers only; no imports from app/ui/storage."""
