# The parity cases by op family, for tests/parity/generate_cases.py. Each family's module holds its
# ops' PyTorch implementations (OPS), their kinks (KINKS) and the templates that draw its cases
# (t_<family>); tables.py merges the tables, case.py builds one case, common.py is what they share.
# dtypes.py, composite.py and errors.py draw cases across the families' ops.
