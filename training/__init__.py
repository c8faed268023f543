"""Ray Train loops, installed as `edje.training`: pretraining, fine-tuning and distillation, their batches, negatives
and losses, and the small backbone's contrastive training (ARCHITECTURE.md lists each module)."""
