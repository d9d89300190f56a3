"""The 1F1B steady state: a clock pattern repeating every few pairs, and its splice into a plan."""
