"""Private: the persistence layer (the ``sessionPersistence`` seam, the storage protocol, the
shared write handle and write-behind, live-session binding, barrier offload, fork).

Plugin authors import these names from :mod:`dsh_host.sdk`; nothing here is a public home.
"""
