"""What overlapping the sync costs in quality, and where its collective runs on a GPU."""
