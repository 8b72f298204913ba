"""The torch module the capture records, handed over by `TorchCapture.install`.

The capture's modules never import torch when they are imported: they are imported once
the script has imported torch (`capture.RECORDERS`), and `install` hands the module
here, where every part of the recorder reads it (`loaded.torch`)."""

torch = None  # the torch module, set at install
