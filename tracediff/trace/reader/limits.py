"""How much an untrusted trace may claim: the bounds the reader checks before it reads
or allocates anything in proportion to what a file says (docs/format.md, "Reading an
untrusted trace").
"""

MAX_MANIFEST_BYTES = 16 << 20
MAX_HEAP_OBJECT_BYTES = 16 << 20   # one variable-length string (the manifest is the largest)
MAX_ONE_STRING_BYTES = 1 << 20     # one entry of the strings table (names, params: short)
MAX_STRINGS = 1 << 24              # entries of the strings table
MAX_ATTR_BYTES = 4096          # root attributes are short strings and numbers
MAX_STRING_BYTES = 256 << 20   # the strings table, all strings together
MAX_CHUNK_BYTES = 64 << 20     # one chunk of a table (the writer uses 1 MiB)
SLACK_BYTES = 1 << 20          # HDF5 overhead allowed when comparing sizes to the file's
MAX_DIMS = 64
MAX_STRING_LEN = 4096          # one string as the reports see it (longer ones are cut)
MAX_HEAP_BYTES = 256 << 20     # one global heap collection (HDF5 makes 4 KiB ones for short strings)
