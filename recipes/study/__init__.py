"""The Multi30k study of Voita et al. 2019's head pruning: evaluations, tests, tables, plots."""
