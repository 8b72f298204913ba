"""The comparison engine's parts, one concern each; `diff/differ.py` puts them together as
`Differ`: output values judged (values), inputs judged (inputs), many simple pairs scanned at
once (scan), the first divergence searched (search), findings built (findings)."""
