"""The training layer: a RunConfig (every setting, validated once), a Trainer (the loop) and the Strategies that
place the model on devices and processes (one device or in-process replicas, DDP/ZeRO under the launcher, the
tensor/pipeline grid).

    from infinitrain.training import RunConfig, Trainer

    Trainer(RunConfig(model="gpt2-tiny", num_iteration=20)).fit()
"""

from infinitrain.training.config import RunConfig
from infinitrain.training.strategy import DataParallel, Local, ModelParallel, Strategy
from infinitrain.training.trainer import Trainer

__all__ = ["DataParallel", "Local", "ModelParallel", "RunConfig", "Strategy", "Trainer"]
