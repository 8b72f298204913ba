"""Which event, module or optimizer state of one run corresponds to which of the other:
sequence alignment of events (sequence), ops only one run executed (structure), module
names (modnames) and optimizer roles (optroles) across frameworks."""
