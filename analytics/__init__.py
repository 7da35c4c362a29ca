"""Offline analytics (extra ``[spark]``): a PySpark job turns the nodes' provider load
histories into tables, findings, a report and recommended weights. Nothing here runs in a
node; it reads what nodes wrote (the schema in ``rpcbus.schema``)."""
