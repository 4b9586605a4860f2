// ReplicaTesting: property engine and simulator.
