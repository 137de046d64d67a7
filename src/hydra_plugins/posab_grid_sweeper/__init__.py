"""Hydra sweeper over a union of grids (hydra/sweeper=grids), for studies that are not one product."""
