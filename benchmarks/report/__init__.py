"""Reports: matrix tables, statistics and plots (``matrix``), README sections (``readme``)."""
