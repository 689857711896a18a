"""The cost model: what a cycle costs and how many tokens it yields, defined once (cycle), the hardware cost
profiles that price it (profile) and the shipped profiles (profiles/). Modules are imported by their own names;
this file holds no code."""
