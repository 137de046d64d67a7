"""NoPE: no positional information (Kazemnejad et al., 2023). Order is only visible through causality."""

from posab.encodings.base import Encoding, Kind


class NoPE(Encoding):
    kind = Kind.NONE
    """The base interface with every method a no-op."""

    relative_only = True
