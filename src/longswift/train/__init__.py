"""Draft-head training on the frozen base: training, data, self-distillation, evaluation."""
