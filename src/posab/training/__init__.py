"""Training a model: the language model's `Trainer` and its settings (`trainer`), the loop and schedule it
shares with the passkey stage (`loop`), the loss (`losses`) and what a checkpoint of a loop holds
(`state`)."""

from posab.training.trainer import TrainConfig, Trainer, TrainResult

__all__ = ["TrainConfig", "TrainResult", "Trainer"]
