"""What a model is to every stage: specs and the embedded cache, loading, the chat template, LoRA targets, adapters, and the processes that train them."""
