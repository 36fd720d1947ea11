"""What bench.py shares with the other scripts of bench/: brokers, /proc readings, phases, the report."""
