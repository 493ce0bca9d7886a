"""The last release's import paths (0.1.0 and before), kept in the checkout so that live stacks keep working.

A dynamic resource's state records its provider pickled by module path and class name (`__provider`); Pulumi's
provider host unpickles it before every call on that resource, `pulumi destroy` included. So every module path a
stack made by 0.1.0 recorded stays importable here, as a thin alias of the module's new home under kimi_cluster/
(tests/repository/test_pickled_providers.py loads the recorded strings). Nothing else lives here, and the wheel does
not ship it: stacks made by 0.1.0 were made from a checkout, whose editable install puts this folder on sys.path.
"""
