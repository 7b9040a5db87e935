"""A biLM's inputs: word ids, character ids, and `TokenBatch`es of tokenised docs."""
