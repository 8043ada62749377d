"""Loading generated modules and running their kernels."""
