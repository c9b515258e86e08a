"""Cloud providers: one Protocol (base.Provider), the simulated cloud, and the real clouds.

Cloud SDKs are imported lazily inside each provider so `reconcile --help` starts fast."""
