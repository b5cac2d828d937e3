"""The recipes of the Multi30k study; their Python is the package ``recipes.study``."""
