"""hydrator: data-locality attributes for HTCondor pools, from Rucio and the SKA DMAPI."""

__version__ = "0.1.0"
