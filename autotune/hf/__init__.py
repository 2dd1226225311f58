"""Hugging Face knowledge: resolving models, the user's data, and TrainingArguments."""
