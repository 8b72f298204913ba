"""Compare two recorded values: tolerances and metrics (values), at any recording level
(levels), across devices (devices), with the notes a finding carries (dtypes, args) and the
rounding noise around zero that is no difference (nearzero)."""
