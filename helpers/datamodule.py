"""A LightningDataModule over the lesson 1 Petastorm converters, aware of the device it runs on.

Each device (Horovod rank, DDP process) reads its own shard; an epoch is one pass over the training data whatever
the device count: with n devices, each runs ``ceil(rows / (batch_size * n))`` steps.
"""

from __future__ import annotations

import pytorch_lightning as pl

from helpers import CourseInputError
from helpers.loaders import PetastormBatches, steps_per_epoch
from helpers.validation import one_of, whole_number

__all__ = ["EPOCH_MODES", "FIXED_STEPS", "ONE_PASS", "FixedStepsDataModule", "PetastormDataModule", "datamodule_for"]

ONE_PASS = "one_pass"  # the right way: an epoch is one pass over the data whatever the device count
FIXED_STEPS = "fixed_steps"  # the original notebooks' way: per-device batch x n, steps per epoch fixed
EPOCH_MODES = (ONE_PASS, FIXED_STEPS)


class PetastormDataModule(pl.LightningDataModule):
    """Training and validation batches from Petastorm converters, for device ``device_id`` of ``device_count``.

    Training keeps one reader open and yields a fixed number of steps per epoch (the same on every device);
    validation reads the device's whole validation shard every epoch.

    Args:
        train_converter: the training rows (a Petastorm ``SparkDatasetConverter``).
        val_converter: the validation rows.
        batch_size: rows per device per step.
        image_size: the side of the square images the batches hold.
        device_id: this device's rank: it reads shard ``device_id`` of ``device_count``.
        device_count: the devices training together.
        workers_count: Petastorm reader threads per loader.

    Raises:
        CourseInputError: ``device_id`` is not one of ``0 .. device_count - 1``, or a count is not a whole number
            of at least 1.
    """

    def __init__(
        self,
        train_converter,
        val_converter,
        batch_size: int = 64,
        image_size: int = 32,
        device_id: int = 0,
        device_count: int = 1,
        workers_count: int = 2,
    ) -> None:
        super().__init__()
        whole_number("device_id", device_id, minimum=0)
        if device_id >= whole_number("device_count", device_count):
            raise CourseInputError(
                f"device_id={device_id!r}: pass a rank below device_count={device_count} (0 .. {device_count - 1})."
            )
        self.train_converter = train_converter
        self.val_converter = val_converter
        self.batch_size = batch_size
        self.image_size = image_size
        self.device_id = device_id
        self.device_count = device_count
        self.workers_count = workers_count
        self.steps_per_epoch = steps_per_epoch(len(train_converter), batch_size, device_count)
        self._open: list[PetastormBatches] = []

    def _batches(self, converter, **kwargs) -> PetastormBatches:
        """A loader over this device's shard of ``converter``, closed again in :meth:`teardown`."""
        batches = PetastormBatches(
            converter,
            self.batch_size,
            self.image_size,
            cur_shard=self.device_id,
            shard_count=self.device_count,
            workers_count=self.workers_count,
            **kwargs,
        )
        self._open.append(batches)
        return batches

    def train_dataloader(self) -> PetastormBatches:
        """This device's training batches: ``self.steps_per_epoch`` shuffled batches per epoch, one open reader."""
        return self._batches(self.train_converter, steps_per_epoch=self.steps_per_epoch, shuffle=True)

    def val_dataloader(self) -> PetastormBatches:
        """This device's whole validation shard, read once per epoch."""
        return self._batches(self.val_converter)

    def teardown(self, stage: str) -> None:
        """Close the readers this module opened."""
        for batches in self._open:
            batches.close()
        self._open.clear()


class FixedStepsDataModule(PetastormDataModule):
    """The original notebooks' epochs, on purpose: the wrong way to compare device counts (lesson 5's pitfall).

    Each of ``device_count`` devices takes ``batch_size * device_count`` rows per step, and an epoch has the
    1-device number of steps, ``ceil(rows / batch_size)``: an "epoch" on n devices reads about n x n times the
    training data. (``PetastormDataModule`` is the right way: per-device batch fixed, steps divided by n.)
    """

    def __init__(
        self,
        train_converter,
        val_converter,
        batch_size: int = 64,
        image_size: int = 32,
        device_id: int = 0,
        device_count: int = 1,
        workers_count: int = 2,
    ) -> None:
        super().__init__(
            train_converter,
            val_converter,
            batch_size * device_count,
            image_size,
            device_id=device_id,
            device_count=device_count,
            workers_count=workers_count,
        )
        self.steps_per_epoch = steps_per_epoch(len(train_converter), batch_size, 1)


def datamodule_for(epoch_mode: str) -> type[PetastormDataModule]:
    """The data module class of an epoch mode.

    Args:
        epoch_mode: ``"one_pass"`` (the right way) or ``"fixed_steps"`` (the original notebooks' pitfall).

    Returns:
        :class:`PetastormDataModule` or :class:`FixedStepsDataModule`.

    Raises:
        CourseInputError: another epoch mode.
    """
    one_of("epoch_mode", epoch_mode, EPOCH_MODES, f"{ONE_PASS!r} is right, {FIXED_STEPS!r} is the pitfall.")
    return PetastormDataModule if epoch_mode == ONE_PASS else FixedStepsDataModule
