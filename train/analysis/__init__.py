"""Analyses of trained models that read their insides rather than their task outputs
(`vlbert analyze …`)."""
