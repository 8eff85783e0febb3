"""PEFT: LoRA adapter directories read onto a run's adapters and written from them."""
