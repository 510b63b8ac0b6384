"""The platform's data kept in an S3-compatible object store, and brought back from it.

Under the prefix of ``--object-store s3://BUCKET/PREFIX``::

    platform.json, lease.json              whose prefix it is, and who holds it now (claim.py)
    pgplane-storage.id                     the storage's id, as nodes compare it
    store/pgplane.db                       the SQLite store's newest copy (storecopy.py)
    history/<project>/<branch>/...         each branch's WAL and base states, and head.json
                                           naming them (compute/local/shared/shipping.py)
    snapshots/<project>/<snapshot>/...     each snapshot's data, packed as a cold archive
    archive/<project>/...                  a detached project's cold archive

Every object but the first two is sealed (compute/local/shared/sealed.py): compressed, then
encrypted and authenticated with a key derived from the operator's archive key and the object's
own name, so the bucket alone reveals no row, role or key, and a damaged, truncated or moved
object is named when read. The platform writes there as root, from its own process: no compute
holds the store's credentials or the archive key, and every key it writes is one the platform
made from ids it checked, never a name a tenant wrote.
"""
