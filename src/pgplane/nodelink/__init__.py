"""The node channel: how one node of the platform reaches another, authenticated and encrypted.

Every node of a platform (the ``serve`` processes sharing one PostgreSQL store) listens on a
*node door* of its own, apart from the doors tenants use, whose address it registers in the store
beside its proxy's. The door speaks TLS 1.3 and takes a connection only from a client that shows a
certificate of the platform's *node authority* (mutual TLS), checked in the handshake, before a
byte of the connection is read; each side checks the other's certificate names the node it
expects. The authority lives in the store, which the platform alone reads: the first node that
needs it makes it, in a transaction, and every node issues itself a certificate from it when it
starts (:mod:`pgplane.nodelink.authority`). It is not the tenant-facing authority of
:mod:`pgplane.tls`, which signs what clients see (also kept in the store, in a table of its own:
:mod:`pgplane.tls.shared`): a certificate of that one opens no node door.

Over the channel a node asks another for what only the project's own node can do
(:mod:`pgplane.nodelink.messages`): a proxied session to one of its computes (the asking node has
authenticated the client; the owning node routes, wakes, dials and logs in itself, from its own
reads of the store), a cancel request, a role's verifier as its running compute holds it, and
the API's direct reads of a project's data (a branch's schema, its history's bounds).
"""
