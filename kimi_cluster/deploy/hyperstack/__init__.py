"""The import paths stacks made by 0.2.0 to 0.3.1 recorded for their Hyperstack providers; nothing else lives here.

A dynamic resource's state records its provider pickled by module path and class name (`__provider`), and Pulumi's
provider host unpickles it before every call on that resource, `pulumi destroy` included. Until 0.3.2 the providers
lived here; they now live in kimi_cluster/deploy/hyperstack_providers/ (a name that says which Hyperstack code it is:
the API client is kimi_cluster/hyperstack_api/, the emulator kimi_cluster/fakes/hyperstack_emulator/). So the two
recorded modules stay as thin aliases of the same classes (tests/repository/test_pickled_providers.py loads the
recorded strings). A pickled provider names its class only (dill pickles an importable class by reference), so no
other module of the old folder was recorded.
"""
