"""Kubernetes' API machinery, redone in plain Python, with no I/O and no layer above it.

What every other layer shares: field errors worded as Kubernetes words them, structural OpenAPI
schemas (defaulting, pruning, validation, CEL rules), the CEL evaluator, where a schema holds a
quantity, strategic merge patch, and the trainer CRDs' OpenAPI schemas. It imports only
``trainer.api`` (the models' constants and quantities) and the standard library.
"""
