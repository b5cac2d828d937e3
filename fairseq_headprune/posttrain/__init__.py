"""Post-training pruning of heads and FFN neurons without retraining.

Kwon et al. 2022, "A Fast Post-Training Pruning Framework for Transformers" (NeurIPS 2022):
``masks`` (a variable per head and neuron), ``fisher`` (importance), ``search`` (budgeted mask
search and rearrangement), ``tuning`` (layer-wise least squares), ``command`` (``prune``).
"""
