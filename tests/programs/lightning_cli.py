"""lightning_clip.py's model and data under LightningCLI, the way Lightning's CLI examples are written:

python lightning_cli.py fit --trainer.max_steps 300 --trainer.gradient_clip_val 1.0 --data.batch_size 32
"""

from lightning.pytorch.cli import LightningCLI

from lightning_clip import ConvNet, StripesData

if __name__ == "__main__":
    LightningCLI(ConvNet, StripesData)
