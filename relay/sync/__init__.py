"""Peer sync: this relay as a NIP-77 client of other relays (`relay sync`, `[[sync.peers]]`)."""
