"""`boomerang chaos`: conversations through the gateway while seeded random faults hit every part."""
