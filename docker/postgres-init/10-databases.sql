-- Run once by the postgres image, on the first start of an empty data volume.
-- warehouse: the dblog target (targets.warehouse.database in dblog.docker.yaml;
--            the engine would also create it on first use).
-- airflow:   Airflow's metadata database (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN).
-- shop, warehouse_pg: the PostgreSQL source (sources.shop_pg) and its target.
-- lake_catalog: the Iceberg targets' SQL catalog (targets.iceberg*.database).
CREATE DATABASE warehouse;
CREATE DATABASE shop;
CREATE DATABASE warehouse_pg;
CREATE DATABASE lake_catalog;
CREATE DATABASE airflow;
