"""fedac: federated audio classification (FedMLAC and friends), simulator and Flower deployment."""

__version__ = "0.1.0"
