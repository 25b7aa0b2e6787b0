"""The DHIM head, its losses, and its checkpoint (torch only)."""
